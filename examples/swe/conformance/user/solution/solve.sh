#!/bin/sh
touch /home/runner/mine.txt
