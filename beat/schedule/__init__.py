"""What a schedule is and when it fires: triggers and their next fire times,
the publish options and payload a schedule may carry, and the schedules defined
in code. Pure: no I/O, no clock but the one given. Every other layer may import
it; it imports only the kernel (``beat.errors``, ``beat.limits``, ``beat.models``)."""
