"""Pure builders: an RLTRun → the manifests of its children. No I/O, no Kopf.

`common` (labels, names, the parts of every pod), `run_children` (ConfigMap, volume claim), `trainer` (the gang:
Service and indexed Job), `generator` (vLLM: Service, StatefulSet, NetworkPolicy). Callers import this package.
"""

from rlt_operator.builders.common import *  # noqa: F403
from rlt_operator.builders.generator import *  # noqa: F403
from rlt_operator.builders.run_children import *  # noqa: F403
from rlt_operator.builders.trainer import *  # noqa: F403
