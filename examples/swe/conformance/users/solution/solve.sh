#!/bin/sh
id -u > /logs/agent-uid
