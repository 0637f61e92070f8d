let x = (;
