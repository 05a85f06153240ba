"""Airflow sensors of the Chasqui provider.  Imports Airflow."""
