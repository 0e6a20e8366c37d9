"""Actuation: from a plan to the pods.

``reconcile`` (pure) turns a desired plan and what the pods hold into an ordered tuple
of actions; ``executor`` runs them against pods in order per pod, bounded and retried;
``apply`` is the IO shell that observes the pods, reconciles and executes.
"""
