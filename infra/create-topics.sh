#!/bin/sh
# Create loopfuse's topics on a Kafka cluster (idempotent) and check their sizes.
#
# Run by the create-topics service of docker-compose.yml with the Apache Kafka image;
# usable as is against any cluster. Environment:
#   BOOTSTRAP_SERVER    host:port of a broker
#   TOPICS              the six loopfuse topics (inputs and outputs), space-separated
#   COMPACTED_TOPICS    the session table's changelog, <app_id>-sessions-changelog
#   REPLY_TOPICS        optional reply topics (= LOOPFUSE_REPLY_TOPICS, space-separated),
#                       created with REPLY_PARTITIONS partitions (= LOOPFUSE_REPLY_PARTITIONS,
#                       default 64) and one hour's retention (a verdict is read in seconds)
#   PARTITIONS          one partition count for all of them (= LOOPFUSE_PARTITIONS)
#   REPLICATION_FACTOR  default 1 (= LOOPFUSE_REPLICATION_FACTOR)
#   COMMAND_CONFIG      optional client properties file (SASL / SSL clusters)
#   KAFKA_TOPICS        path of kafka-topics.sh (default /opt/kafka/bin/kafka-topics.sh)
#
# Input topics and the changelog must all have PARTITIONS partitions: a session's
# events, its table updates and its state must live on one partition number
# (co-partitioning), and a topic's count cannot be changed without moving keys. So an
# existing topic of another size is an error here (the worker refuses it as well).
set -eu

: "${BOOTSTRAP_SERVER:?set BOOTSTRAP_SERVER}" "${TOPICS:?set TOPICS}" "${PARTITIONS:?set PARTITIONS}"
REPLICATION_FACTOR=${REPLICATION_FACTOR:-1}
COMPACTED_TOPICS=${COMPACTED_TOPICS:-}
REPLY_TOPICS=${REPLY_TOPICS:-}
REPLY_PARTITIONS=${REPLY_PARTITIONS:-64}
KAFKA_TOPICS=${KAFKA_TOPICS:-/opt/kafka/bin/kafka-topics.sh}

common="--bootstrap-server $BOOTSTRAP_SERVER"
if [ -n "${COMMAND_CONFIG:-}" ]; then
    common="$common --command-config $COMMAND_CONFIG"
fi

create() {  # topic partitions [--config k=v]
    topic=$1
    count=$2
    shift 2
    # shellcheck disable=SC2086  # $common is a list of options
    "$KAFKA_TOPICS" $common --create --if-not-exists --topic "$topic" \
        --partitions "$count" --replication-factor "$REPLICATION_FACTOR" "$@"
}

partitions_of() {
    # shellcheck disable=SC2086
    "$KAFKA_TOPICS" $common --describe --topic "$1" | awk -v t="$1" '
        $1 == "Topic:" && $2 == t {
            for (i = 3; i < NF; i++) if ($i == "PartitionCount:") { print $(i + 1); exit }
        }'
}

for topic in $TOPICS; do
    create "$topic" "$PARTITIONS"
done
for topic in $COMPACTED_TOPICS; do
    create "$topic" "$PARTITIONS" --config cleanup.policy=compact
done
# Any partition count works for a reply topic (a gateway reads the count it has).
for topic in $REPLY_TOPICS; do
    create "$topic" "$REPLY_PARTITIONS" --config retention.ms=3600000
done

status=0
for topic in $TOPICS $COMPACTED_TOPICS; do
    count=$(partitions_of "$topic")
    if [ "$count" != "$PARTITIONS" ]; then
        echo "create-topics: topic $topic has ${count:-no} partitions, expected $PARTITIONS" >&2
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "create-topics: $TOPICS $COMPACTED_TOPICS: $PARTITIONS partitions each"
exit "$status"
