-- Runs once, on the first start of an empty postgres volume (docker-entrypoint-initdb.d).
-- One database per service so that MLflow's, Prefect's and Optuna's schema migrations never
-- touch each other's tables. The owner is $POSTGRES_USER (the role the entrypoint creates);
-- to re-run this script, remove the volume: docker compose ... down -v
CREATE DATABASE mlflow;
CREATE DATABASE prefect;
CREATE DATABASE optuna;
