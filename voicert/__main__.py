import sys

from voicert.cli import main

sys.exit(main())
