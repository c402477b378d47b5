import pytest

SLURM_TREE = """\
# two leaves under one spine, then a lone leaf
SwitchName=leaf1 Nodes=gpu[01-04] LinkSpeed=400
SwitchName=leaf2 Nodes=gpu[05-08] LinkSpeed=400
SwitchName=leaf3 Nodes=gpu[09-10] LinkSpeed=400
SwitchName=spine1 Switches=leaf[1-2] LinkSpeed=400
SwitchName=spine2 Switches=leaf3 LinkSpeed=400
SwitchName=top Switches=spine[1-2] LinkSpeed=400
"""


@pytest.fixture
def slurm_file(tmp_path):
    path = tmp_path / "topology.conf"
    path.write_text(SLURM_TREE)
    return path
