#!/bin/sh
echo two >> /app/log.txt
