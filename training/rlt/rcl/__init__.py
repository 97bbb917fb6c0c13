"""Method rcl: adaptive teaching. A student probe (pass 1), teacher guidance conditioned on it (pass 2), a reward
from the student's accuracy gain that charges losses double, and the APG/NDR/TES evaluation. Its stage functions are
in rlt.stages.rcl."""
