"""The leader's side of a beat process.

- Who leads (``leadership``): the Redis lease, the epoch in the leader row, and the
  watchdog that lets the lease go when this process cannot do the work.
- The loop (``loop``): lead, maintenance, claim, publish, arm and wait, one pass at
  a time. It sees its collaborators through the Protocols of ``ports``, so its
  rules are tested on in-memory fakes; its state (``loop_state``), how it sends
  (``publishing``), how far ahead it claims and how long it waits
  (``claim_pacing``) and its maintenance pass (``maintenance``: the outbox, the
  reaper, lost messages, retention) are parts of their own.
- Runs claimed ahead and held until their fire time (``armed``), one send
  overlapping the next claim (``overlapped_send``), the search for messages the
  broker lost (``lost_messages``), and what the loop tells people and Prometheus
  (``reporting``).
"""
