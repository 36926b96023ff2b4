#!/bin/bash
set -euo pipefail
true
