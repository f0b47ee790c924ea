#include <iostream>
int main() { std::cout << "ration\n"; }
