"""The leader's side of a beat process: who leads (``leadership``), the loop of
lead, maintenance, claim, publish, arm and wait (``loop``), runs claimed ahead
and held until their fire time (``armed``), one send overlapping the next claim
(``overlapped_send``), the search for messages the broker lost
(``lost_messages``) and what the loop tells people and Prometheus
(``reporting``). The loop sees its collaborators through Protocols, so its rules
are tested on in-memory fakes."""
