"""Before step 1, in the driver (the launcher's process): the command line (``args``, with the resolve/validate half
of the ``--classmate.*`` / ``--engine.*`` groups in ``classmate_args``, ``model_options``, ``sampling_checks``), the
preflight that checks a run in seconds before Ray starts (``preflight``, ``preflight_data``, ``preflight_types``,
the GPU layout and batch arithmetic in ``layout``), the start-up breakdown (``startup``) and the one-line reports of
a run's end (``actor_died``, ``terminated``). Imports the stage packages below it, never ``trainer``."""
