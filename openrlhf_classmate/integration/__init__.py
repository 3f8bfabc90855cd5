"""The OpenRLHF 0.11.2 glue: launcher, engines, experience maker, actor. Every rebinding of upstream names lives in
:mod:`openrlhf_classmate.integration.patches`; the algorithm itself is in :mod:`openrlhf_classmate.algo`."""
