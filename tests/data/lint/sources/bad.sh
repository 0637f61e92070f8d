#!/bin/sh
files=$1
for f in $files; do
  echo $f
done
cd /tmp
if [ "$files" == "x" ]; then echo `date`; fi
echo $undefined_var $@
