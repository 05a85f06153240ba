"""asyncio shells over the sans-I/O core: Queue (producer), Worker, promoter, scheduler, events.

Imports ``redis`` but never Airflow or PySpark: worker pods load only this.
"""
