"""A secured Apache Kafka for tests and ``loopfuse broker --kafka --secure``: TLS made on
the spot, SCRAM-SHA-512 users per role, the standard authorizer denying what no ACL allows.

An *edge* module beside :mod:`loopfuse.streams.local.kafka_broker`. It makes, once per data
folder (``DIR/security``, private to the user):

* a certificate authority (``ca.pem``) that signs one broker certificate
  (``broker.pem``: key and chain, subject ``CN=loopfuse-broker``, SAN the loopback
  address and ``localhost``) and nothing else; clients trust the CA file and nothing
  else (``LOOPFUSE_SSL_CAFILE``);
* a password per user (``users.json``, mode 0600): ``admin`` (a super user, which the
  ACL script runs as) and one per role, ``worker``, ``gateway`` (the default tenant's
  gateway), ``gateway-b`` (tenant ``b``'s: its own topics, docs/wire-format.md: Tenants),
  ``auditor`` and ``whatif`` (reads what ``loopfuse whatif`` judges, writes nothing).
  They go into the KRaft storage when it is formatted (``--add-scram``), so they exist
  before the first client connects;
* one environment file per user (``USER.env``: ``LOOPFUSE_SECURITY_PROTOCOL=SASL_SSL`` and
  the rest), which is what an operator would give each process, ``admin.properties``,
  the ``--command-config`` of Kafka's own tools, and ``kafka-acls``, Kafka's ACL tool on
  the launcher's jars.

:meth:`KafkaSecurity.grant_roles` then applies the shipped ACL script for each role
(``infra/kafka/kafka-acls.sh``): what the README's "Running in production" lists.

A node then has three listeners: ``CLIENT`` (SASL_SSL, SCRAM-SHA-512) for every client,
and ``INTERNAL`` (replication) and ``CONTROLLER`` (the quorum), both TLS with the broker
certificate required of the peer (mutual TLS; that certificate's subject is a super
user). No listener is plaintext: nothing on this machine reaches the data without a
password or the broker's key.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BROKER_PRINCIPAL", "ROLES", "TENANTS", "KafkaSecurity", "SecurityError"]

#: The users a secured broker is made with: a super user and one per role.
ROLES = ("admin", "worker", "gateway", "gateway-b", "auditor", "whatif")
#: Each gateway user's tenant ("": the default tenant, whose topics are unsuffixed).
TENANTS = {"gateway": "", "gateway-b": "b"}
#: The principal the broker certificate authenticates as (mutual TLS between nodes).
BROKER_PRINCIPAL = "User:CN=loopfuse-broker"
MECHANISM = "SCRAM-SHA-512"
#: The certificates' life: long enough for a test run or a week of experiments.
_DAYS = "30"


class SecurityError(RuntimeError):
    """The TLS material could not be made (openssl missing or failing)."""


@dataclass(frozen=True)
class KafkaSecurity:
    """The TLS files and SCRAM users of one secured broker or cluster (see the module)."""

    folder: Path
    host: str

    @classmethod
    def create(cls, data_dir: Path, host: str) -> KafkaSecurity:
        """Make (or reuse: a restarted node keeps its users) ``data_dir/security``."""
        security = cls(data_dir / "security", host)
        security._ensure()
        return security

    # -- files ----------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        return self.folder / "broker.pem"

    @property
    def admin_properties(self) -> Path:
        """Kafka tools' ``--command-config`` as the super user."""
        return self.folder / "admin.properties"

    def env_file(self, user: str) -> Path:
        return self.folder / f"{user}.env"

    def users(self) -> list[str]:
        """The users this folder was made with (:data:`ROLES` when it was made)."""
        users: dict[str, str] = json.loads((self.folder / "users.json").read_text())
        return list(users)

    def password(self, user: str) -> str:
        users: dict[str, str] = json.loads((self.folder / "users.json").read_text())
        return users[user]

    def client_env(self, user: str) -> dict[str, str]:
        """The ``LOOPFUSE_*`` variables of a process connecting as ``user``; the worker's
        name the tenants it serves, a tenant's gateway its tenant (:data:`TENANTS`)."""
        env = {
            "LOOPFUSE_SECURITY_PROTOCOL": "SASL_SSL",
            "LOOPFUSE_SASL_MECHANISM": MECHANISM,
            "LOOPFUSE_SASL_USERNAME": user,
            "LOOPFUSE_SASL_PASSWORD": self.password(user),
            "LOOPFUSE_SSL_CAFILE": str(self.ca_file),
        }
        if user in ("worker", "whatif"):  # both serve, or read, every tenant
            env["LOOPFUSE_TENANTS"] = ",".join(t for t in TENANTS.values() if t)
        elif TENANTS.get(user):
            env["LOOPFUSE_TENANT"] = TENANTS[user]
        return env

    def client_kwargs(self, user: str) -> dict[str, object]:
        """aiokafka options connecting as ``user`` (tests, the launcher's probe)."""
        from aiokafka.helpers import create_ssl_context  # lazy: keeps this module light

        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "sasl_plain_username": user,
            "sasl_plain_password": self.password(user),
            "ssl_context": create_ssl_context(cafile=str(self.ca_file)),
        }

    @property
    def acl_tool(self) -> Path:
        """Kafka's ``kafka-acls`` for this broker's jars (what ``KAFKA_ACLS`` names for
        ``infra/kafka-acls.sh``)."""
        return self.folder / "kafka-acls"

    def write_tools(self, java_command: list[str]) -> None:
        """Write :attr:`acl_tool`, running Kafka's AclCommand with ``java_command``
        (java, its flags and class path)."""
        command = " ".join(f"'{part}'" for part in java_command)
        self.acl_tool.write_text(
            f'#!/bin/sh\nexec {command} org.apache.kafka.tools.AclCommand "$@"\n'
        )
        os.chmod(self.acl_tool, 0o700)

    def grant_roles(self, bootstrap: str, env: dict[str, str] | None = None) -> None:
        """Give each role's user its ACLs with the shipped script
        (``infra/kafka/kafka-acls.sh``, as the super user): the default tenant's gateway
        its reply topic, each other gateway its tenant's topics (:data:`TENANTS`).
        ``env`` adds the script's variables (``LOOPFUSE_TOPIC_*`` when not the
        defaults)."""
        from loopfuse.streams.local.kafka_broker import INFRA  # the script's home

        variables = {
            **os.environ,
            **(env or {}),
            "BOOTSTRAP_SERVER": bootstrap,
            "COMMAND_CONFIG": str(self.admin_properties),
            "KAFKA_ACLS": str(self.acl_tool),
        }
        replies = variables.get("LOOPFUSE_REPLY_TOPICS", "loopfuse.replies").split(",")[0]
        for role in (
            ["worker", "User:worker"],
            *(
                ["tenant", f"User:{user}", tenant]
                if tenant
                else ["gateway", f"User:{user}", replies]
                for user, tenant in TENANTS.items()
            ),
            ["auditor", "User:auditor"],
            ["whatif", "User:whatif"],
        ):
            done = subprocess.run(
                ["sh", str(INFRA / "kafka-acls.sh"), *role],
                env=variables,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                tail = " / ".join(done.stderr.strip().splitlines()[-3:])
                raise SecurityError(f"kafka-acls.sh {role[0]} {role[1]} failed: {tail}")

    # -- the broker's side ------------------------------------------------------------

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments creating every user."""
        arguments: list[str] = []
        for user in self.users():
            arguments += [
                "--add-scram",
                f"{MECHANISM}=[name={user},password={self.password(user)}]",
            ]
        return arguments

    def broker_properties(self, client: str, internal: str, controller: str) -> dict[str, str]:
        """Listener, TLS, SASL and authorizer settings of a node whose three listeners are
        at the given ``host:port`` addresses."""
        return {
            "listeners": f"CLIENT://{client},INTERNAL://{internal},CONTROLLER://{controller}",
            "advertised.listeners": f"CLIENT://{client},INTERNAL://{internal}",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            # One key and chain serves the listeners and the node's own client side
            # (replication, the quorum); PEM files, so no keytool and no store password.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "listener.name.internal.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.client.sasl.enabled.mechanisms": MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"{BROKER_PRINCIPAL};User:admin",
        }

    # -- making it --------------------------------------------------------------------

    def _ensure(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        users = self.folder / "users.json"
        if not users.exists():
            passwords = {user: secrets.token_hex(16) for user in ROLES}
            _write_private(users, json.dumps(passwords, indent=1))
        if not self.broker_keystore.exists():
            self._make_certificates()
        # A folder made before a role was added keeps its users (its storage has them);
        # that role's user is then missing, and the rest work as before.
        for user in self.users():
            env = "".join(f"{k}={v}\n" for k, v in self.client_env(user).items())
            _write_private(self.env_file(user), env)
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{self.password("admin")}";'
        )
        _write_private(
            self.admin_properties,
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={MECHANISM}\n"
            f"sasl.jaas.config={jaas}\n"
            "ssl.truststore.type=PEM\n"
            f"ssl.truststore.location={self.ca_file}\n",
        )

    def _make_certificates(self) -> None:
        folder = self.folder
        ca_key, key, csr, crt = (
            folder / n for n in ("ca.key", "broker.key", "broker.csr", "broker.crt")
        )
        extensions = folder / "broker.ext"
        extensions.write_text(
            f"subjectAltName=IP:{self.host},DNS:localhost\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            ca_key,
            "-out",
            self.ca_file,
            "-days",
            _DAYS,
            "-subj",
            "/CN=loopfuse test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        )
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            key,
            "-out",
            csr,
            "-subj",
            "/CN=loopfuse-broker",
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            self.ca_file,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            crt,
            "-days",
            _DAYS,
            "-extfile",
            extensions,
        )
        # Kafka's PEM keystore: the PKCS#8 key, then the chain.
        _write_private(self.broker_keystore, key.read_text() + crt.read_text())
        for path in (csr, extensions, folder / "ca.srl"):
            path.unlink(missing_ok=True)
        os.chmod(ca_key, 0o600)
        os.chmod(key, 0o600)


def _openssl(*arguments: object) -> None:
    try:
        done = subprocess.run(
            ["openssl", *map(str, arguments)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise SecurityError("a secured broker needs openssl, which is not installed") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SecurityError("openssl failed making the test certificates: " + " / ".join(tail))


def _write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (passwords, keys)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
