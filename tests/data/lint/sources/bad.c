int twice(int x);
int main(void) {
    int unused;
    return twice(1, 2);
}
