#!/bin/sh
echo one > /app/log.txt
