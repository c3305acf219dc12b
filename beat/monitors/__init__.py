"""Monitors: when what a schedule's runs did opens, updates or resolves one of its
incidents, decided from its newest outcomes. Pure: the leader reads the outcomes and
writes what is decided (``beat.store.leader.monitors``)."""
