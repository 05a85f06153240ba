"""Airflow triggers of the Chasqui provider; they run in the triggerer.  Imports Airflow."""
