"""Flower's floor: a Flower app whose ServerApp sends the model's arrays to its nodes and whose
ClientApp sends them back unchanged, written out by `feddb overhead` (simulation and deployment)
to time what Flower alone costs a round."""

from __future__ import annotations

FLOOR_APP = '''
"""Flower's floor: the arrays go to {per_round} nodes a round and come back unchanged."""
import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@client.train()
def echo(msg: Message, context: Context) -> Message:
    return Message(RecordDict({{"arrays": msg.content["arrays"]}}), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    shapes = json.loads(cfg["shapes"])
    arrays = ArrayRecord({{k: Array(np.zeros(s, np.float32)) for k, s in shapes.items()}})
    while len(list(grid.get_node_ids())) < {nodes}:
        time.sleep(0.1)
    nodes = sorted(grid.get_node_ids())
    rng = np.random.default_rng(0)
    seconds = []
    for r in range(int(cfg["rounds"])):
        t0 = time.perf_counter()
        msgs = [Message(RecordDict({{"arrays": arrays, "config": ConfigRecord({{"round": r}})}}),
                        dst_node_id=nodes[i], message_type=MessageType.TRAIN)
                for i in rng.choice(len(nodes), {per_round}, replace=False)]
        replies = list(grid.send_and_receive(msgs))
        arrays = replies[0].content["arrays"]
        seconds.append(time.perf_counter() - t0)
    with open(cfg["out"], "w") as f:
        json.dump(seconds, f)
'''

FLOOR_PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flowerfloor"
version = "1.0.0"
dependencies = ["flwr"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "feddb"

[tool.flwr.app.components]
serverapp = "floorapp:server"
clientapp = "floorapp:client"

[tool.flwr.app.config]
rounds = 10
shapes = ""
out = ""
"""


def model_shapes(overrides: list[str] | None = None) -> dict[str, list[int]]:
    """The shapes of the configured model's state (the arrays every message carries)."""
    from fssl.methods import make_model
    from server_app.config import compose

    cfg = compose(overrides or [])
    channels = 1 if cfg["dataset"]["name"] == "mnist10k" else 3
    model = make_model(cfg, 10, channels)
    return {k: list(v.shape) for k, v in model.state_dict().items()}
