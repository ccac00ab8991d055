"""The comms logger's arithmetic and table held against DeepSpeed 0.19.8's own
(deepspeed/utils/comms_logging.py), fed the same records: calc_bw_log's bandwidths for every op
family, convert_size's strings, log_all's printed lines, and DeepSpeedCommsConfig turning the
logger on whenever the section is present."""

import contextlib
import io

import pytest

from deepspeed_child import NEEDS_DEEPSPEED, answer_in_child

pytestmark = NEEDS_DEEPSPEED

WORLD = 4
OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast",
       "send", "barrier"]
SIZES = [0, 1, 1000, 1536, 1 << 20, 7 * (1 << 30) // 3]
# (op, log name, latency ms, bytes): repeated sizes, an op under two names, one slow outlier
RECORDS = [("all_reduce", "all_reduce", 1.25, 600), ("all_reduce", "all_reduce", 2.5, 600),
           ("all_reduce", "all_reduce", 40.0, 600), ("all_reduce", "all_reduce", 0.75, 8),
           ("broadcast", "broadcast", 3.0, 196), ("barrier", "log_summary_barrier", 0.5, 0)] + \
          [("all_gather_into_tensor", "all_gather_into_tensor", 0.1 * k + 0.3, 304) for k in range(12)]


def deepspeeds(_):
    import deepspeed.comm as dist
    from deepspeed.comm.config import DeepSpeedCommsConfig
    from deepspeed.utils import comms_logging
    dist.get_world_size = lambda group=None: WORLD   # calc_bw_log asks the comm layer; no ranks here
    logger = comms_logging.CommsLogger()
    for record in RECORDS:
        logger.append(*record)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        logger.log_all()
    return {"bw": [comms_logging.calc_bw_log(op, 1 << 20, 1.5) for op in OPS],
            "sizes": [comms_logging.convert_size(s) for s in SIZES],
            "table": printed.getvalue().splitlines(),
            "on": [DeepSpeedCommsConfig(c).comms_logger_enabled
                   for c in ({}, {"comms_logger": {"enabled": False}}, {"comms_logger": {"enabled": True}})]}


@pytest.fixture(scope="module")
def theirs():
    return answer_in_child("test_ds_comms_logger_peer", "deepspeeds", "")


def test_same_bandwidths_sizes_and_table(theirs):
    from minitron.runtime.config import DeepSpeedConfig
    from minitron.utils.comms_logging import CommsLogger, calc_bw_log, convert_size
    assert [list(calc_bw_log(op, 1 << 20, 1.5, WORLD)) for op in OPS] == theirs["bw"]   # same arithmetic: equal
    assert [convert_size(s) for s in SIZES] == theirs["sizes"]
    logger = CommsLogger()
    logger.world_size = WORLD
    for record in RECORDS:
        logger.append(*record)
    assert logger.table() == theirs["table"]
    base = {"train_batch_size": 4}
    assert [DeepSpeedConfig({**base, **c}, world_size=2).comms_config["enabled"]
            for c in ({}, {"comms_logger": {"enabled": False}}, {"comms_logger": {"enabled": True}})] == theirs["on"]
