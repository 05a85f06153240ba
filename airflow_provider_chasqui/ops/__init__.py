"""The ``chasqui`` command line for operators (inspect, dlq, repeatable, events, watch)."""
