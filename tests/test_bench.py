"""The benchmark's own measuring: what it calls parity run's memory must count every process."""

import subprocess
import sys

from parity.bench import TreeMemoryPeak

# A parent holding 150 MB that starts a child holding 250 MB: both resident for a second.
HOLDERS = """
import subprocess, sys, numpy as np
held = np.ones(150 * 2**20 // 8)
child = "import time, numpy as np; held = np.ones(250 * 2**20 // 8); time.sleep(1)"
subprocess.run([sys.executable, "-c", child], check=True)
"""


def test_tree_memory_peak_counts_the_children_of_a_process():
    process = subprocess.Popen([sys.executable, "-c", HOLDERS])
    peak = TreeMemoryPeak(process, period=0.02)
    assert process.wait() == 0
    assert peak.mb() > 150 + 250          # either process alone holds less
