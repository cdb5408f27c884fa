#!/bin/sh
# One-shot schema setup for Temporal on PostgreSQL (runs in temporalio/admin-tools; idempotent:
# "create" fails harmlessly on an existing database, update-schema only applies missing versions).
set -eu
HOST=${POSTGRES_SEEDS:-postgresql}
PORT=${DB_PORT:-5432}
USER=${POSTGRES_USER:-temporal}
SCHEMA_DIR=/etc/temporal/schema/postgresql/v12

echo "waiting for PostgreSQL at $HOST:$PORT"
until nc -z -w 2 "$HOST" "$PORT"; do sleep 1; done

for db in temporal temporal_visibility; do
  case $db in
    temporal) dir=$SCHEMA_DIR/temporal/versioned ;;
    *) dir=$SCHEMA_DIR/visibility/versioned ;;
  esac
  sql="temporal-sql-tool --plugin postgres12 --ep $HOST -p $PORT -u $USER --db $db"
  $sql create || echo "database $db already exists"
  $sql setup-schema -v 0.0 || echo "schema of $db already initialised"
  $sql update-schema -d "$dir"
done
echo "Temporal schema ready"
