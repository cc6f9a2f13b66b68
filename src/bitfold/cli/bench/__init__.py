"""``bitfold bench``: the cost of determinism, measured against every peer.

* :mod:`.command`: the command (options, checks, the run, the outputs);
* :mod:`.cases`: the sweeps and the inputs of each case;
* :mod:`.contenders`: every fold it compares (also the baselines of ``bitfold probe``);
* :mod:`.measure`: timing the contenders of one case in this process;
* :mod:`.worker`: peak memory and thread-count digests in fresh processes
  (``python -m bitfold.cli.bench.worker SPEC``);
* :mod:`.startup`: Numba's cold and warm start;
* :mod:`.load`: the seed configuration under one extra busy process under load;
* :mod:`.steps`, :mod:`.compiled_steps`: whole training steps, eager and compiled;
* :mod:`.report`, :mod:`.plots`: ``summary.md``, the table and the PNG plots.
"""
