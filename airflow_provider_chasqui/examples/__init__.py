"""Example job handlers used by ``example_dags/`` and the provider's end-to-end tests.

Shipped in the package so a worker (or a Spark driver) registers them by dotted path,
without the DAG folder and without Airflow.  Must never import airflow.
"""
