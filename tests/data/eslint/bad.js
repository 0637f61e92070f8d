var unused = 1;
if (unused == 2) { console.log("x"); }
