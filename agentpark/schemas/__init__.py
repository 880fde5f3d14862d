"""The REST API's request and response bodies, shared by the API and the client.

Wire models only, on a floor below both :mod:`agentpark.api` (which serves them) and
:mod:`agentpark.client` (which sends and reads them): they import nothing from the store,
the session core or the API, so the client never loads the daemon's layers.

- :mod:`agentpark.schemas.sessions`: sessions, events, drain
- :mod:`agentpark.schemas.host`: host, dashboard, admin and health routes
- :mod:`agentpark.schemas.auth`: the token routes
"""
