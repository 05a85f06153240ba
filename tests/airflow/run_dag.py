"""Run DAGs with ``dag.test()`` in this process; print one JSON summary line per run.

Usage: ``python run_dag.py '[["<dag_id>", {run conf}], ...]'`` with AIRFLOW_HOME (migrated
DB), AIRFLOW__CORE__DAGS_FOLDER and the chasqui connection in the environment.  Each summary
(a line starting with ``RESULT ``) holds the run state, every task instance's state, every
XCom and the wall time of that ``dag.test()``.  A subprocess keeps Airflow's state (config,
ORM, the in-process execution API) out of pytest; running several DAGs in one process pays
Airflow's start-up (about 10 s here) once.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    runs = json.loads(sys.argv[1])
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"import errors: {bag.import_errors}")
    for dag_id, run_conf in runs:
        started = time.monotonic()
        dr = bag.get_dag(dag_id).test(run_conf=run_conf)
        elapsed = time.monotonic() - started
        with create_session() as session:
            tis = {ti.task_id: ti.state for ti in dr.get_task_instances(session=session)}
            rows = session.scalars(XComModel.get_many(run_id=dr.run_id, dag_ids=dag_id)).all()
            xcoms = {f"{x.task_id}.{x.key}": XComModel.deserialize_value(x) for x in rows}
        summary = {"dag_id": dag_id, "state": dr.state, "tis": tis, "xcom": xcoms, "seconds": round(elapsed, 3)}
        print("RESULT " + json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
