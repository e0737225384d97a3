"""Prints which replica of which pool this process is, as rigdeck and its cluster files say."""

import argparse
import json
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--sleep", type=float, default=1.0)
args = parser.parse_args()
cluster = json.loads(os.environ.get("CLUSTER_SPEC") or "{}")
tf = json.loads(os.environ.get("TF_CONFIG") or "{}")
print(f"pool={os.environ.get('RIGDECK_POOL')} replica={os.environ.get('RIGDECK_POOL_REPLICA')} "
      f"host={os.environ.get('RIGDECK_CURRENT_HOST')} torch_rank={os.environ.get('RANK', '-')} "
      f"vertex_task={cluster.get('task')} tf_task={tf.get('task')} "
      f"note={os.environ.get('ROLE_NOTE', '-')}", flush=True)
time.sleep(args.sleep)
