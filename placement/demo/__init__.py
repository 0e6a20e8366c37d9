"""``lorafleet demo``: the whole loop on one machine, as local processes."""
