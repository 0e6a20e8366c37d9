"""Actuation: from a plan to the pods.

``reconcile`` (pure) turns a desired plan and what the pods hold into an ordered tuple
of actions: its input, ``PodState``, and what the plan wants of each pod are in
``reconcile_pods``, the phases that emit the actions in ``reconcile_replay``.
``executor`` runs them against pods in order per pod, bounded and retried; ``apply`` is
the IO shell that observes the pods, reconciles and executes.
"""
