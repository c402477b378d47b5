from django.core.files.uploadedfile import SimpleUploadedFile

from fabric.models import Fabric, Host
from tests.factories import client_for, make_org


def upload(text: str, name: str = "topology.conf") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, text.encode(), content_type="text/plain")


def import_lab(client, text, name="lab"):
    return client.post("/api/v1/fabrics/import/",
                       {"file": upload(text), "format": "slurm", "name": name},
                       format="multipart")


def test_a_provider_imports_a_fabric_and_reads_its_summary(provider_client):
    from tests.fabric.conftest import SLURM_TREE

    response = import_lab(provider_client, SLURM_TREE)

    body = response.json()
    assert response.status_code == 201, body
    assert body["name"] == "lab"
    assert body["owner"] == "hpc-provider"
    assert body["link_rate_gbps"] == "400.0"
    assert body["summary"]["domain_counts"] == {"node": 10, "leaf": 3, "spine": 2, "fabric": 1}
    detail = provider_client.get(f"/api/v1/fabrics/{body['id']}/").json()
    assert detail["summary"]["levels"] == ["node", "leaf", "spine", "fabric"]


def test_reimporting_answers_200_and_keeps_the_same_fabric(provider_client):
    from tests.fabric.conftest import SLURM_TREE

    first = import_lab(provider_client, SLURM_TREE).json()
    second = import_lab(provider_client, SLURM_TREE)

    assert second.status_code == 200
    assert second.json()["id"] == first["id"]
    assert Host.objects.count() == 10


def test_a_bad_file_answers_400_naming_the_file_field_and_line(provider_client):
    response = import_lab(provider_client, "SwitchName=leaf1 Nodes=gpu[01-04\n")

    body = response.json()
    assert response.status_code == 400
    assert body["error"]["code"] == "invalid"
    assert body["error"]["fields"]["file"][0].startswith("topology.conf:1:")
    assert Fabric.objects.count() == 0


def test_a_link_speed_too_big_for_the_database_answers_400_and_saves_nothing(provider_client):
    # Found by the importer fuzzer (2026-11-30): LinkSpeed=1e12 was a 500 (numeric overflow).
    response = import_lab(provider_client, "SwitchName=s1 Nodes=gpu[01-04] LinkSpeed=1e12\n")

    assert response.status_code == 400
    assert response.json()["error"]["fields"]["file"][0].startswith("topology.conf:1: LinkSpeed")
    assert not Fabric.objects.exists()


def test_a_name_too_long_for_the_database_answers_400_and_saves_nothing(provider_client):
    # Found by the importer fuzzer (2026-11-30): a 201-character host name was a 500.
    response = import_lab(provider_client, "SwitchName=s1 Nodes=" + "n" * 201 + "\n")

    assert response.status_code == 400
    assert "longer than 64 characters" in response.json()["error"]["fields"]["file"][0]
    assert not Fabric.objects.exists()


def test_an_unknown_format_or_missing_name_names_the_field(provider_client):
    response = provider_client.post(
        "/api/v1/fabrics/import/", {"file": upload("x"), "format": "xml"}, format="multipart"
    )

    fields = response.json()["error"]["fields"]
    assert response.status_code == 400
    assert set(fields) == {"format", "name"}


def test_a_rival_provider_cannot_see_or_export_anothers_fabric(provider_client, rival_provider):
    from tests.fabric.conftest import SLURM_TREE

    fabric_id = import_lab(provider_client, SLURM_TREE).json()["id"]
    rival = client_for(rival_provider)

    assert rival.get("/api/v1/fabrics/").json()["results"] == []
    assert rival.get(f"/api/v1/fabrics/{fabric_id}/").status_code == 404
    assert rival.get(f"/api/v1/fabrics/{fabric_id}/topology.conf").status_code == 404


def test_a_rival_cannot_overwrite_a_fabric_by_importing_under_its_name(provider_client,
                                                                      rival_provider):
    from tests.fabric.conftest import SLURM_TREE

    import_lab(provider_client, SLURM_TREE)

    response = import_lab(client_for(rival_provider), "SwitchName=s Nodes=x[1-2]\n")

    assert response.status_code == 400
    assert "belongs to another organisation" in response.json()["error"]["fields"]["file"][0]
    assert sorted(Host.objects.values_list("name", flat=True))[0] == "gpu01"


def test_a_tenant_cannot_import_and_sees_no_fabric_details(provider_client, tenant):
    from tests.fabric.conftest import SLURM_TREE

    import_lab(provider_client, SLURM_TREE)
    tenant_client = client_for(tenant)

    assert import_lab(tenant_client, SLURM_TREE, name="mine").status_code == 403
    listing = tenant_client.get("/api/v1/fabrics/").json()["results"]
    assert listing == []


def test_a_key_without_the_provide_scope_cannot_import(provider):
    from tests.fabric.conftest import SLURM_TREE

    read_only = client_for(provider, scopes=("read",))

    response = import_lab(read_only, SLURM_TREE)

    assert response.status_code == 403
    assert Fabric.objects.count() == 0


def test_an_operator_sees_every_fabric(provider_client, operator):
    from tests.fabric.conftest import SLURM_TREE

    import_lab(provider_client, SLURM_TREE)

    names = [f["name"] for f in client_for(operator).get("/api/v1/fabrics/").json()["results"]]

    assert names == ["lab"]


def test_topology_conf_exports_tree_and_block_as_plain_text(provider_client):
    from tests.fabric.conftest import SLURM_TREE

    fabric_id = import_lab(provider_client, SLURM_TREE).json()["id"]

    tree = provider_client.get(f"/api/v1/fabrics/{fabric_id}/topology.conf")
    block = provider_client.get(f"/api/v1/fabrics/{fabric_id}/topology.conf?format=slurm-block")
    bad = provider_client.get(f"/api/v1/fabrics/{fabric_id}/topology.conf?format=xml")

    assert tree.status_code == 200
    assert tree["Content-Type"].startswith("text/plain")
    assert "SwitchName=" in tree.content.decode() and "Nodes=gpu[01-04]" in tree.content.decode()
    assert "BlockName=" in block.content.decode()
    assert bad.status_code == 400


def test_a_tenant_sees_only_levels_and_counts_of_the_fabrics_it_leases_on(db):
    from billing import services as money
    from market import orders, prices
    from pool.models import Node
    from tests.market.inventory import provider_with_nodes

    provider = provider_with_nodes()
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="test")
    leasing_tenant = make_org("acme-ai", "tenant")
    bystander = make_org("other-ai", "tenant")
    money.grant_credit(organization=leasing_tenant, amount_micros=100_000_000, reason="t",
                       actor="t")
    orders.place_order(tenant=leasing_tenant, actor="t", request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=8, hours=1, tier="on_demand", max_price_micros=2_000_000))
    client = client_for(leasing_tenant)

    [seen] = client.get("/api/v1/fabrics/").json()["results"]

    assert set(seen) == {"id", "name", "kind", "link_rate_gbps", "summary"}
    assert seen["summary"]["domain_counts"]["leaf"] == 2
    assert "uplink_gbps" not in seen["summary"]  # it names switches
    assert "hpc-provider" not in str(seen)
    assert client.get(f"/api/v1/fabrics/{seen['id']}/topology.conf").status_code == 404
    assert client_for(bystander).get("/api/v1/fabrics/").json()["results"] == []


def test_topology_conf_errors_are_json_and_say_so(provider_client):
    # Found by the API fuzzer (2026-11-30): a 404 or 400 came back as JSON labelled text/plain.
    from tests.fabric.conftest import SLURM_TREE

    fabric_id = import_lab(provider_client, SLURM_TREE).json()["id"]

    missing = provider_client.get("/api/v1/fabrics/0/topology.conf")
    bad = provider_client.get(f"/api/v1/fabrics/{fabric_id}/topology.conf?format=xml")

    assert missing.status_code == 404
    assert missing["Content-Type"] == "application/json"
    assert missing.json()["error"]["code"] == "not_found"
    assert bad["Content-Type"] == "application/json"
    assert bad.json()["error"]["fields"]["format"]
