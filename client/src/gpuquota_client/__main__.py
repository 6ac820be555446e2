from gpuquota_client.cli import main

raise SystemExit(main())
