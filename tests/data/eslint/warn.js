let warnOnly = 1;
