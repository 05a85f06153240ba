"""Sans-I/O core: keys, codecs, Lua scripts and command building.

Nothing under ``core`` opens a socket or imports ``redis``: the asyncio engine, the
blocking twin and the Airflow hooks all drive the same pure functions.  Only the
standard library and ``msgpack`` (plus ``croniter`` for cron maths) may be imported here.
"""
