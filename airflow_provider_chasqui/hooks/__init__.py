"""Airflow hooks of the Chasqui provider (``chasqui`` connection type).  Imports Airflow."""
