import sys

from openrlhf_classmate.demo.cli import main

sys.exit(main())
