-- Run once by the postgres:15 image on an empty volume (as the superuser postgres/postgres).
-- The same role and database as scripts/services/postgres.sh creates without Docker.
CREATE ROLE outbox LOGIN CREATEROLE REPLICATION PASSWORD 'outbox';
CREATE DATABASE outbox OWNER outbox;
