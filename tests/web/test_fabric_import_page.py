"""A provider imports a fabric file from its page; a bad file is refused next to the field,
naming the line, and imports nothing."""

from pathlib import Path

from django.core.files.uploadedfile import SimpleUploadedFile

from fabric.models import Fabric

DATA = Path(__file__).resolve().parents[1] / "fabric" / "data"


def upload(name: str, content: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="text/plain")


def test_the_provider_page_points_at_the_real_import_endpoint_and_has_a_form(provider_web):
    page = provider_web.get("/provider/").content.decode()

    assert "POST /api/v1/fabrics/import/" in page
    assert "POST /api/v1/fabrics/</code>" not in page
    assert 'enctype="multipart/form-data"' in page and 'id="fabric-import"' in page


def test_a_provider_imports_an_ibnetdiscover_file_from_its_page(provider_web, provider):
    text = (DATA / "two_leaves_two_spines.ibnetdiscover").read_bytes()

    response = provider_web.post("/provider/fabrics/", {
        "name": "hall-b", "format": "ibnetdiscover", "gpus_per_node": "8",
        "file": upload("hall-b.txt", text)}, follow=True)

    fabric = Fabric.objects.get(owner=provider, name="hall-b")
    assert response.status_code == 200
    assert f"Fabric hall-b imported: {fabric.hosts.count()} hosts" in response.content.decode()
    assert fabric.hosts.count() > 0


def test_a_bad_slurm_file_is_refused_naming_the_line_and_imports_nothing(provider_web,
                                                                          provider):
    response = provider_web.post("/provider/fabrics/", {
        "name": "broken", "format": "slurm", "gpus_per_node": "8",
        "file": upload("topology.conf", b"SwitchName=s1 Nodes=n[1-2]\nthis is no line\n")})

    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_file_error"' in page and "topology.conf:2: malformed line" in page
    assert not Fabric.objects.filter(name="broken").exists()


def test_a_tenant_cannot_import_a_fabric(tenant_web):
    response = tenant_web.post("/provider/fabrics/", {
        "name": "x", "format": "slurm", "file": upload("t.conf", b"SwitchName=s1 Nodes=n1\n")})

    assert response.status_code in (403, 404) and not Fabric.objects.filter(name="x").exists()
