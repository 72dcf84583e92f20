"""What sinfo prints, read as Slurm writes it: the GRES field (%G) of a partition's nodes.

The grammar is Slurm's own code (SchedMD/slurm, src/interfaces/gres.c, _build_node_gres_str and
_core_bitmap2str; src/common/bitstring.c, bit_fmt): each GRES is name[:type][:no_consume]:count with a
K/M/G/T/P suffix for multiples of 1024 and, where gres.conf binds it to cores (Cores=, AutoDetect=nvml),
(S:sockets), the sockets a comma-separated list of numbers and ranges; GRES are separated by commas and
a node without any shows "(null)". GresUsed writes (IDX:...) where %G writes (S:...).
"""

from __future__ import annotations

import pytest
from helpers import ROOT

from containerbench import config as cb_config
from containerbench import slurm


@pytest.mark.parametrize("field, gpus", [
    ("(null)", 0),
    ("gpu:4", 4),
    ("gpu:h100:4", 4),
    ("gpu:h100:4(S:0-1)", 4),                     # the socket-affinity form that crashed the cluster check
    ("gpu:h100:8(S:0,2)", 8),                     # bit_fmt: sockets 0 and 2, a comma inside the parentheses
    ("gpu:a100:2(S:0),gpu:v100:2(S:1)", 4),       # one GRES per type: a node's GPUs are their sum
    ("mps:400(S:0-1),gpu:tesla:2(S:0-1)", 2),     # MPS shares are not GPUs
    ("gpu:k20c:1,mic:knc:1", 1),
    ("gpu:h100:no_consume:4", 4),
    ("nvme:1,gpu:h100:4(S:0-1),bandwidth:lustre:no_consume:4G", 4),
    ("gpu:h100:2(IDX:0-1)", 2),                   # GresUsed's form
])
def test_the_gpus_of_a_node_are_read_from_every_form_slurm_writes(field, gpus):
    assert slurm.gpus_of(field) == gpus


def test_counts_keep_name_and_type_apart_and_read_slurms_suffixes():
    assert slurm.gres_counts("gpu:a100:2(S:0),gpu:v100:2(S:1),bandwidth:lustre:no_consume:4G,nic:1K") == {
        ("gpu", "a100"): 2, ("gpu", "v100"): 2, ("bandwidth", "lustre"): 4 * 1024**3, ("nic", None): 1024}


@pytest.mark.parametrize("field, where", [
    ("gpu:h100:four", "gpu:h100:four"),
    ("gpu:4(S:0-1", "(S:0-1"),
    ("gpu:4,nvme", "nvme"),
    ("gpu:4,", "ends with a comma"),
])
def test_a_gres_field_slurm_would_not_write_is_refused_in_one_line_naming_it(field, where):
    with pytest.raises(slurm.QueryError) as refused:
        slurm.gres_counts(field)
    message = str(refused.value)
    assert message.startswith(f"sinfo's GRES field (%G) {field!r} ") and where in message and "\n" not in message


def test_where_sinfo_cannot_answer_the_cluster_check_says_so_in_one_line(capsys):
    config = cb_config.load([ROOT / "tests" / "slurm" / "config.yaml"])
    # No sinfo on the PATH of the command that asks (an `env` with an empty PATH): as on a host outside the cluster.
    slurm.check_cluster(config, cb_config.plan_runs(config), via=("env", "PATH=/nonexistent"))
    assert capsys.readouterr().err == slurm.NOT_CHECKED + "\n"
