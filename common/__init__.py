"""What both sides of the data flow share, torch-free: the run bundle's format and readers
(`bundle`), facts about this host (`host`), compiling the C parts (`native`), and the one
error type for unusable input (`errors`). Probe, collectives, analyzers, plan and the gate
import it; it imports none of them."""
