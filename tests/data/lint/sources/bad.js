var a = 1;
let unused = 2;
if (a == "1") {
  console.log(a);
}
