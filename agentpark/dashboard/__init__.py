"""The dashboard page's assets (HTML, stylesheet, script), shipped as package data.

``agentpark.api.dashboard`` inlines the stylesheet and the script into the page, so
/dashboard is one self-contained document: no CDN, nothing from outside the daemon.
"""
