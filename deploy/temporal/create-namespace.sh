#!/bin/sh
# Create the namespace Narwhal uses and register the search attributes of workflows/steps.py (idempotent).
set -eu
ADDRESS=${TEMPORAL_ADDRESS:-temporal:7233}
NAMESPACE=${TEMPORAL_NAMESPACE:-default}

attempt=0
until temporal operator cluster health --address "$ADDRESS"; do
  attempt=$((attempt + 1))
  [ "$attempt" -lt 30 ] || { echo "Temporal at $ADDRESS is not healthy"; exit 1; }
  sleep 2
done

temporal operator namespace describe -n "$NAMESPACE" --address "$ADDRESS" >/dev/null 2>&1 \
  || temporal operator namespace create -n "$NAMESPACE" --retention 72h --address "$ADDRESS"

# A new namespace becomes visible to other frontend calls after a cache refresh (~10 s): retry.
for sa in NarwhalFleet=Keyword NarwhalState=Keyword; do
  name=${sa%%=*}
  type=${sa#*=}
  attempt=0
  until temporal operator search-attribute list -n "$NAMESPACE" --address "$ADDRESS" 2>/dev/null \
      | grep -qw "$name"; do
    attempt=$((attempt + 1))
    [ "$attempt" -lt 60 ] || { echo "cannot register search attribute $name"; exit 1; }
    temporal operator search-attribute create -n "$NAMESPACE" --name "$name" --type "$type" \
      --address "$ADDRESS" 2>/dev/null || sleep 1
  done
done
echo "namespace $NAMESPACE ready with search attributes NarwhalFleet, NarwhalState"
