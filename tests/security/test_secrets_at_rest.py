"""Secrets: API keys and node tokens live only as hashes, and are compared in constant time."""

import ast
import hashlib
from pathlib import Path

from django.db import connection

from ibex.accounts import services as accounts
from pool import services as pool
from tests.factories import make_org

ROOT = Path(__file__).resolve().parents[2]
APPS = ["ibex", "fabric", "pool", "market", "notify", "scheduler", "web", "agent"]
SECRET_WORDS = ("hash", "token", "secret", "signature", "digest", "password")


def _database_text() -> str:
    """Every text column of every IBEX table, as one string (a full dump of the rows)."""
    chunks = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        for (table,) in cursor.fetchall():
            cursor.execute(f'SELECT t::text FROM "{table}" t')  # noqa: S608 - our own table names
            chunks.extend(row[0] for row in cursor.fetchall())
    return "\n".join(chunks)


def test_an_api_key_is_stored_only_as_its_hash(db):
    org = make_org("acme-ai", "tenant")
    issued = accounts.issue_api_key(organization=org, scopes=["read"])
    secret_part = issued.raw_key.split("_", 2)[2]

    stored = _database_text()

    assert issued.raw_key not in stored and secret_part not in stored
    assert issued.api_key.key_hash == hashlib.sha256(issued.raw_key.encode()).hexdigest()
    assert issued.api_key.key_hash in stored


def test_a_node_token_is_stored_only_as_its_hash(db):
    from fabric import services as fabric_services
    from fabric.core import generators

    provider = make_org("hpc-provider", "provider")
    pool.ensure_gpu_catalogue()
    fabric_services.save_fabric(owner=provider, name="lab", spec=generators.fat_tree(2, 4, tiers=2),
                                source="generator")
    registered = pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
        hostname="node01", fabric="lab", gpu_model="H100-80GB", gpu_count=8, cpu_cores=64,
        memory_gib=512)])[0]
    rotated = pool.rotate_node_token(node=registered.node)

    stored = _database_text()

    for token in (registered.token, rotated):
        assert token not in stored and token.split("_", 2)[2] not in stored


def _secret_comparisons(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq))
                                                 for op in node.ops):
            names = [ast.unparse(side).lower() for side in (node.left, *node.comparators)]
            if any("prefix" in name for name in names):
                continue  # a key's or token's visible prefix is public: it finds the row
            if any(fingerprint in name for name in names for fingerprint in
                   ("topology_hash", "acknowledged_hash", "routes_hash", "acknowledged_routes")):
                continue  # a fingerprint of the fabric's links or routes (docs/fabric.md),
                # not a secret
            if any(word in name for name in names for word in SECRET_WORDS):
                yield node.lineno, " vs ".join(names)


def test_secrets_are_compared_only_in_constant_time():
    """No `==` or `!=` between things named like hashes, tokens, secrets or signatures:
    those comparisons go through hmac.compare_digest (API keys, node tokens, webhook and
    Stripe signatures)."""
    found = []
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for line, what in _secret_comparisons(ast.parse(path.read_text())):
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert found == [], "\n".join(found)
