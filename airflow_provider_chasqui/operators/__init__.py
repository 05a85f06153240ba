"""Airflow operators of the Chasqui provider.  Imports Airflow."""
