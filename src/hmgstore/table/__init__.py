"""The tables users hold: :class:`~hmgstore.HybridTensor` (:mod:`.tensor`, its state and lifecycle in
:mod:`.state`, how it crosses processes in :mod:`.pickling`), tables read from files (:mod:`.files`), one table
over several GPUs of a process (:mod:`.sharded`), and how a gather's rate falls with the host pages it touches
(:mod:`.host_pages`)."""
