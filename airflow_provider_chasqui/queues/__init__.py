"""common-messaging queue providers of the Chasqui provider (``MessageQueueTrigger(scheme="chasqui")``)."""
