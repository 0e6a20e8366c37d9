"""The controller: scheduled ticks, their ports and state, leadership and the webhook.

``ticks`` (the ``Controller``: ingest, forecast, plan and apply, timed preloads,
watchdog) runs over the ports of ``ports``; ``schedule`` says when; ``live_ports``
implements the ports over the rest of lorafleet; ``leader`` elects one acting replica;
``webhook`` takes pipeline and login events; ``config`` parses ``controller.yaml``;
``wiring`` is the composition root that builds all of it.
"""
