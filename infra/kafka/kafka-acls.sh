#!/bin/sh
# Grant one loopfuse role its ACLs on a Kafka cluster whose authorizer denies what no ACL
# allows (allow.everyone.if.no.acl.found=false). Idempotent: an ACL that exists is kept.
#
#   infra/kafka/kafka-acls.sh worker  PRINCIPAL
#   infra/kafka/kafka-acls.sh gateway PRINCIPAL REPLY_TOPIC
#   infra/kafka/kafka-acls.sh tenant  PRINCIPAL TENANT
#   infra/kafka/kafka-acls.sh auditor PRINCIPAL [GROUP]
#   infra/kafka/kafka-acls.sh whatif  PRINCIPAL
#
# PRINCIPAL is Kafka's form, User:NAME. A gateway of the default tenant is granted one
# reply topic (one of LOOPFUSE_REPLY_TOPICS); a tenant's gateway its tenant's topics
# (docs/wire-format.md: Tenants; the worker's LOOPFUSE_TENANTS names the tenant); an
# auditor its consumer group (default loopfuse-notify, the one `loopfuse notify` uses;
# `tail` and `audit` use none). Environment:
#   BOOTSTRAP_SERVER   host:port of a broker (required)
#   COMMAND_CONFIG     client properties of a principal allowed to alter ACLs (SASL / SSL)
#   KAFKA_ACLS         the kafka-acls tool (default kafka-acls.sh on PATH, as installed
#                      with Apache Kafka; /opt/kafka/bin/kafka-acls.sh in its image)
#   DRY_RUN=1          print the commands instead of running them
#   LOOPFUSE_*         the worker's topic names and app id, when not the defaults:
#                      LOOPFUSE_TOPIC_TOOL_CALLS, _TOOL_RESULTS, _COMPACTIONS, _VERDICTS,
#                      _LOOP_EVENTS, _DEAD_LETTERS, _TOOL_STRIKES, _TOOL_BREAKERS,
#                      LOOPFUSE_REPLY_TOPICS (comma-separated), LOOPFUSE_APP_ID
#
# What each role gets, and why nothing more (README: Running in production):
#   worker   Read its input topics and its consumer group (LOOPFUSE_APP_ID); Write the
#            verdicts, loop events, dead letters and every reply topic; Read+Write the
#            fleet breaker's two topics; all of that with Describe (metadata) and Create
#            (it creates what is missing at start; drop Create if an admin runs
#            infra/create-topics.sh). The input, verdicts and reply topics are granted by
#            prefix (agent.tool-calls covers agent.tool-calls.TENANT), so a new tenant
#            needs no new grant for the worker. Its own topics, the session changelog and Faust's
#            internal ones, share the prefix "APP_ID-": Read, Write, Create, Describe,
#            DescribeConfigs on that prefix. Idempotent producing needs no cluster ACL
#            (Kafka 3.0+: Write on a topic implies it).
#   tenant   Write the tenant's three input topics; Read its verdicts topic and its reply
#            topics; each by its literal name, nothing by prefix: tenant "a" gets nothing
#            of tenant "ab". No consumer group.
#   gateway  Write the input topics; Read its reply topic. Not the verdicts topic: a v1
#            gateway (no reply_to) needs Read there and then sees every tenant's verdicts.
#            No consumer group: its reader is assigned its partition, never joins one.
#   auditor  Read the loop events and dead letters, and its consumer group.
#   whatif   Read (and Describe) every tenant's input, verdicts and reply topics, by
#            prefix as the worker's, and the loop events: `loopfuse whatif` reads them
#            assigned, with no consumer group, and writes nothing.
# Nobody but the worker may write a verdict, a reply or a loop event: a forged `allow` is
# refused by the broker.
set -eu

usage() {
    echo "usage: $0 worker PRINCIPAL | gateway PRINCIPAL REPLY_TOPIC | tenant PRINCIPAL TENANT | auditor PRINCIPAL [GROUP] | whatif PRINCIPAL" >&2
    exit 2
}
[ $# -ge 2 ] || usage
role=$1
principal=$2
case "$principal" in User:?*) ;; *) echo "$0: PRINCIPAL is User:NAME, got '$principal'" >&2; exit 2 ;; esac
: "${BOOTSTRAP_SERVER:?set BOOTSTRAP_SERVER}"
KAFKA_ACLS=${KAFKA_ACLS:-kafka-acls.sh}

calls=${LOOPFUSE_TOPIC_TOOL_CALLS:-agent.tool-calls}
results=${LOOPFUSE_TOPIC_TOOL_RESULTS:-agent.tool-results}
compactions=${LOOPFUSE_TOPIC_COMPACTIONS:-agent.compactions}
verdicts=${LOOPFUSE_TOPIC_VERDICTS:-loopfuse.verdicts}
loop_events=${LOOPFUSE_TOPIC_LOOP_EVENTS:-loopfuse.loop-events}
dead_letters=${LOOPFUSE_TOPIC_DEAD_LETTERS:-loopfuse.dead-letters}
strikes=${LOOPFUSE_TOPIC_TOOL_STRIKES:-loopfuse.tool-strikes}
breakers=${LOOPFUSE_TOPIC_TOOL_BREAKERS:-loopfuse.tool-breakers}
replies=${LOOPFUSE_REPLY_TOPICS-loopfuse.replies}
app_id=${LOOPFUSE_APP_ID:-loopfuse}

acl() {  # kafka-acls options after --add --allow-principal PRINCIPAL
    set -- --bootstrap-server "$BOOTSTRAP_SERVER" ${COMMAND_CONFIG:+--command-config "$COMMAND_CONFIG"} \
        --add --allow-principal "$principal" "$@"
    if [ "${DRY_RUN:-}" = 1 ]; then
        echo "$KAFKA_ACLS $*"
    else
        "$KAFKA_ACLS" "$@" >/dev/null
    fi
}

topics() {  # --topic A --topic B ... from a space-separated list
    for t in "$@"; do printf -- '--topic\n%s\n' "$t"; done
}

case "$role" in
    worker)
        [ $# -eq 2 ] || usage
        reply_args=""
        for t in $(echo "$replies" | tr ',' ' '); do reply_args="$reply_args --topic $t"; done
        # shellcheck disable=SC2046,SC2086  # topic lists are words by construction
        acl --operation Read --operation Describe --operation Create \
            --resource-pattern-type prefixed $(topics "$calls" "$results" "$compactions")
        acl --operation Read --operation Describe --group "$app_id"
        # shellcheck disable=SC2046,SC2086
        acl --operation Write --operation Describe --operation Create \
            --resource-pattern-type prefixed $(topics "$verdicts") $reply_args
        # shellcheck disable=SC2046
        acl --operation Write --operation Describe --operation Create \
            $(topics "$loop_events" "$dead_letters")
        # shellcheck disable=SC2046
        acl --operation Read --operation Write --operation Describe --operation Create \
            $(topics "$strikes" "$breakers")
        acl --operation Read --operation Write --operation Create --operation Describe \
            --operation DescribeConfigs --resource-pattern-type prefixed --topic "$app_id-"
        ;;
    gateway)
        [ $# -eq 3 ] || usage
        # shellcheck disable=SC2046
        acl --operation Write --operation Describe $(topics "$calls" "$results" "$compactions")
        acl --operation Read --operation Describe --topic "$3"
        ;;
    tenant)
        [ $# -eq 3 ] || usage
        tenant=$3
        case "$tenant" in
            *[!A-Za-z0-9_-]* | "") echo "$0: TENANT is A-Z a-z 0-9 _ -, got '$tenant'" >&2; exit 2 ;;
        esac
        reply_args=""
        for t in $(echo "$replies" | tr ',' ' '); do reply_args="$reply_args --topic $t.$tenant"; done
        # shellcheck disable=SC2046
        acl --operation Write --operation Describe \
            $(topics "$calls.$tenant" "$results.$tenant" "$compactions.$tenant")
        # shellcheck disable=SC2086
        acl --operation Read --operation Describe --topic "$verdicts.$tenant" $reply_args
        ;;
    auditor)
        [ $# -le 3 ] || usage
        # shellcheck disable=SC2046
        acl --operation Read --operation Describe $(topics "$loop_events" "$dead_letters")
        acl --operation Read --operation Describe --group "${3:-loopfuse-notify}"
        ;;
    whatif)
        [ $# -eq 2 ] || usage
        reply_args=""
        for t in $(echo "$replies" | tr ',' ' '); do reply_args="$reply_args --topic $t"; done
        # shellcheck disable=SC2046,SC2086  # topic lists are words by construction
        acl --operation Read --operation Describe --resource-pattern-type prefixed \
            $(topics "$calls" "$results" "$compactions" "$verdicts") $reply_args
        acl --operation Read --operation Describe --topic "$loop_events"
        ;;
    *) usage ;;
esac
