"""train.distributed.check_rendezvous: a launcher environment whose ranks can never meet is refused up front,
naming the variable and the fix (``torchrun --master-port 0`` hung every rank until the rendezvous timeout)."""

from __future__ import annotations

import pytest

from lego_rl.errors import ConfigError
from lego_rl.train.distributed import check_rendezvous


@pytest.mark.parametrize("port", ["0", "00", "65536", "-1", "", "auto", "29500 "])
def test_a_port_no_rank_can_meet_on_is_refused(port: str) -> None:
    with pytest.raises(ConfigError, match=r"MASTER_PORT=.* torchrun --master-port 29500") as err:
        check_rendezvous({"MASTER_PORT": port, "WORLD_SIZE": "2"})
    assert err.value.parameter == "MASTER_PORT" and repr(port) in str(err.value)


@pytest.mark.parametrize("env", [{}, {"MASTER_PORT": "29500"}, {"MASTER_PORT": "1"}, {"MASTER_PORT": "65535"}])
def test_a_usable_or_absent_port_passes(env: dict[str, str]) -> None:
    check_rendezvous(env)
