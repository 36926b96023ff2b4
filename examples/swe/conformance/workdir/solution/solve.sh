#!/bin/sh
touch here.txt
